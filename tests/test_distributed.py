"""crossfuse under torch.distributed (:mod:`crossfuse.harness.distributed`, :mod:`.dist_checkpoint`).

On the CPU: two processes under ``torchrun`` with the gloo backend (the kernels under Triton's interpreter,
a one-block GPT-2 of width 32), DDP and FSDP2 each against the same run with torch's LayerNorm, and DCP
checkpoints across world sizes (two processes, and a world of one in this process). On one GPU: both
wrappers at a world of one. On two GPUs: both wrappers over nccl, DCP from two GPUs to one, and the ops
with tensors on device 1 while device 0 is current, on a stream other than the default.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from crossfuse.harness import dist_checkpoint as dcpk
from crossfuse.harness import distributed as D

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers", reason="the distributed runs build transformers models")


def torchrun(nproc: int, module: str, *args: str, device: str = "cpu", timeout: int = 240):
    """``torchrun --standalone`` (a free port of its own) of ``module`` in ``nproc`` processes; on the CPU
    the children select Triton's interpreter before they import it."""
    path = os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", module, *args, "--device", device]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def read_rows(out: Path) -> list[dict]:
    (path,) = out.glob("distributed-*.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


def check_run(proc, out: Path, wrappers: tuple[str, ...], world: int, dtype: torch.dtype) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[dist" in proc.stderr and "step 1/" in proc.stderr  # progress lines
    rows = read_rows(out)
    assert len(rows) == len(wrappers) * world * 2
    tol = D.TOLERANCES[dtype]
    for r in rows:
        assert r["wrapper"] in wrappers and r["world"] == str(world) and float(r["step_ms"]) > 0
        if r["impl"] == "crossfuse":
            assert r["status"] == "ok", r
            assert int(r["swapped"]) > 0
            assert float(r["loss_err"]) <= tol.loss and float(r["grad_err"]) <= tol.grad
            assert float(r["param_err"]) <= tol.param
    assert {int(r["rank"]) for r in rows} == set(range(world))
    assert "| crossfuse" in next(out.glob("distributed-*.md")).read_text()


# ----------------------------------------------------------------------------------------------------
# CPU: two processes with gloo
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_two_processes_on_the_cpu_with_gloo(wrapper, tmp_path):
    proc = torchrun(2, "crossfuse.harness.distributed", "--wrappers", wrapper, "--steps", "2", "--warmup",
                    "0", "--out", str(tmp_path))  # fmt: skip
    check_run(proc, tmp_path, (wrapper,), 2, torch.float32)


def test_checkpoint_from_two_processes_loads_at_a_world_of_one(tmp_path, device):
    proc = torchrun(2, "crossfuse.harness.dist_checkpoint", "save", str(tmp_path), "--wrapper", "fsdp")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "full.pt").is_file() and any((tmp_path / "dcp").glob("*.distcp"))
    cfg = D.DistConfig(device=device, size="tiny", steps=1, warmup=0).resolved()
    lines: list[str] = []
    problems = dcpk.run_load(tmp_path, cfg, ("none", "fsdp"), lambda ctx, s: lines.append(s))
    assert problems == []
    assert sum("all equal" in s for s in lines) == 4, lines  # torch's and crossfuse's models, two wrappers


def test_checkpoint_from_a_world_of_one_loads_in_two_processes(tmp_path, device):
    cfg = D.DistConfig(device=device, size="tiny", steps=1, warmup=0).resolved()
    dcpk.run_save(tmp_path, cfg, "fsdp", lambda ctx, s: None)
    assert (tmp_path / "meta.json").is_file()
    proc = torchrun(2, "crossfuse.harness.dist_checkpoint", "load", str(tmp_path), "--wrapper", "fsdp,ddp")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("all equal") == 4, proc.stderr[-4000:]


def test_a_changed_tensor_is_reported(tmp_path, device):
    cfg = D.DistConfig(device=device, size="tiny", steps=1, warmup=0).resolved()
    dcpk.run_save(tmp_path, cfg, "none", lambda ctx, s: None)
    ref = torch.load(tmp_path / "full.pt")
    ref["transformer.ln_f.weight"] += 1  # the reference no longer what the checkpoint holds
    torch.save(ref, tmp_path / "full.pt")
    problems = dcpk.run_load(tmp_path, cfg, ("none",), lambda ctx, s: None)
    assert problems == [f"{impl} (none): transformer.ln_f.weight: values differ by up to 1"
                        for impl in D.IMPLS]  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# CPU: the pieces, in this process
# ----------------------------------------------------------------------------------------------------


def test_swapped_state_dict_has_torchs_keys_and_loads_both_ways():
    from crossfuse.nn import LayerNorm, swap_layer_norms

    plain, _ = D.build_model("gpt2", "tiny", 0)
    swapped, _ = D.build_model("gpt2", "tiny", 0)
    assert len(swap_layer_norms(swapped)) == 3
    assert isinstance(swapped.transformer.ln_f, LayerNorm)
    a, b = plain.state_dict(), swapped.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other, _ = D.build_model("gpt2", "tiny", 1)
    other.load_state_dict(b)
    assert torch.equal(other.transformer.ln_f.bias, a["transformer.ln_f.bias"])
    ln, tln = LayerNorm(8), torch.nn.LayerNorm(8)
    assert list(ln.state_dict()) == list(tln.state_dict()) == ["weight", "bias"]


def test_relative_l2_of_replicated_and_sharded_tensors(device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    cfg = D.DistConfig(device=device).resolved()
    with D.process_group(cfg) as ctx:
        ref = {"a": torch.ones(4, device=ctx.device), "b": torch.zeros(3, device=ctx.device)}
        got = {"a": torch.ones(4, device=ctx.device), "b": torch.full((3,), 2.0, device=ctx.device)}
        assert D.relative_l2(got, ref, ctx) == pytest.approx(3**0.5)  # sqrt(3 * 2²) / sqrt(4)
        mesh = init_device_mesh(ctx.device.type, (1,))
        shard = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in got.items()}
        ref_shard = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in ref.items()}
        assert D.relative_l2(shard, ref_shard, ctx) == pytest.approx(3**0.5)
        assert D.relative_l2(ref, ref, ctx) == 0.0


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(model="llama"), "model must be one of"),
        (dict(size="huge"), "size must be one of"),
        (dict(wrappers=("ddp", "zero")), "wrappers must be"),
        (dict(wrappers=()), "wrappers must be"),
        (dict(steps=0), "steps must be >= 1"),
        (dict(steps=2, warmup=2), "warmup must be in [0, steps)"),
        (dict(batch=0), "batch must be >= 1"),
        (dict(device="tpu"), "device must be"),
        (dict(dtype=torch.int32), "dtype must be one of"),
        (dict(backend="mpi"), "backend must be gloo or nccl"),
        (dict(lr=0.0), "lr must be > 0"),
    ],
)
def test_bad_configuration_names_the_field(fields, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        D.DistConfig(**fields)


def test_nccl_on_the_cpu_is_refused():
    with pytest.raises(ValueError, match="backend='nccl' needs device='cuda'"):
        D.DistConfig(device="cpu", backend="nccl").resolved()


def test_command_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        D.main(["--wrappers", "ddp,zero"])
    assert e.value.code == 2 and "wrappers must be" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dcpk.main(["save", str(tmp_path), "--wrapper", "ddp,fsdp"])
    assert e.value.code == 2 and "--wrapper must be one of" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match=r"meta\.json not found"):
        dcpk.run_load(tmp_path, D.DistConfig(device="cpu").resolved(), ("none",), lambda ctx, s: None)


def test_report_marks_errors_past_the_tolerances():
    cfg = D.DistConfig(device="cpu", wrappers=("ddp",)).resolved()
    res = {"torch": dict(step_ms=2.0, swapped=None), "crossfuse": dict(step_ms=4.0, swapped=3, loss_err=0.0,
           grad_err=1e-2, param_err=0.0)}  # fmt: skip
    rows = D.rows_of([{"ddp": res}], cfg, 1, "cmd")
    assert [r["status"] for r in rows] == ["ref", "fail"]
    assert rows[1]["speedup"] == pytest.approx(0.5)
    text = D.render(rows, cfg)
    assert "crossfuse (3 LN swapped)" in text and "fail" in text and "interpreter" in text


# ----------------------------------------------------------------------------------------------------
# GPUs
# ----------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_both_wrappers_at_a_world_of_one_on_the_gpu(tmp_path):
    cfg = D.DistConfig(device="cuda", size="small", batch=2, seq=128, steps=3, warmup=1, out=tmp_path)
    rows = D.run(cfg, "test")
    assert [r["status"] for r in rows if r["impl"] == "crossfuse"] == ["ok", "ok"], rows
    assert all(r["peak_mib"] > 0 for r in rows)
    assert read_rows(tmp_path)[0]["device"] == "cuda"


def needs_two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA GPUs, found {torch.cuda.device_count()}")


@pytest.mark.gpu
def test_both_wrappers_on_two_gpus_with_nccl(tmp_path):
    needs_two_gpus()
    args = ("--size", "small", "--batch", "2", "--seq", "128", "--steps", "3", "--warmup", "1")
    proc = torchrun(2, "crossfuse.harness.distributed", *args, "--out", str(tmp_path), device="cuda",
                    timeout=600)  # fmt: skip
    check_run(proc, tmp_path, D.WRAPPERS, 2, torch.bfloat16)


@pytest.mark.gpu
def test_checkpoint_from_two_gpus_loads_on_one(tmp_path):
    needs_two_gpus()
    proc = torchrun(2, "crossfuse.harness.dist_checkpoint", "save", str(tmp_path), "--wrapper", "fsdp",
                    "--size", "small", device="cuda", timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = D.DistConfig(device="cuda", size="small", steps=1, warmup=0).resolved()
    assert dcpk.run_load(tmp_path, cfg, ("none", "fsdp"), lambda ctx, s: None) == []


@pytest.mark.gpu
def test_ops_on_device_one_on_its_own_stream_while_device_zero_is_current(gen):
    import crossfuse
    from crossfuse.nn import LayerNorm
    from crossfuse.reference.attention import relu_attention_ref

    needs_two_gpus()
    dev = torch.device("cuda", 1)
    M, N, (B, H, L, Dh) = 256, 1024, (2, 2, 256, 64)
    host = [torch.randn(M, N, generator=gen), *(torch.randn(B, H, L, Dh, generator=gen) for _ in range(3))]
    src = [t.bfloat16().to(dev) for t in host]
    ln = LayerNorm(N, device=dev, dtype=torch.bfloat16)
    ref_ln = torch.nn.LayerNorm(N, device=dev, dtype=torch.bfloat16)
    ref_ln.load_state_dict(ln.state_dict())
    stream = torch.cuda.Stream(device=dev)
    inputs = [torch.zeros_like(t) for t in src]
    torch.cuda.synchronize(dev)
    with torch.cuda.device(dev), torch.cuda.stream(stream):  # device 1 current here, with its stream
        torch.cuda._sleep(100_000_000)  # the inputs' values arrive on this stream only after the spin:
        for dst, s in zip(inputs, src, strict=True):  # a kernel on another stream would read zeros
            dst.copy_(s)
        x, q, k, v = (t.requires_grad_() for t in inputs)
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(dev) == stream
            y = ln(x)
            out = crossfuse.relu_attention(q, k, v, causal=True)
            loss = y.float().square().sum() + out.float().square().sum()
            grads = torch.autograd.grad(loss, (x, q, ln.weight))
        y_ref = ref_ln(x)
        g_ref = torch.autograd.grad(y_ref.float().square().sum(), (x, ref_ln.weight))
        out_ref = relu_attention_ref(*(t.detach().float() for t in (q, k, v)), causal=True)
    torch.cuda.synchronize(dev)
    assert y.device == dev and out.device == dev and all(g.device == dev for g in grads)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grads[0].float(), g_ref[0].float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(grads[2].float(), g_ref[1].float(), rtol=5e-2, atol=5e-1)
    torch.testing.assert_close(out.float(), out_ref, rtol=3e-2, atol=3e-2)
    assert bool(torch.isfinite(grads[1]).all()) and grads[1].abs().sum() > 0
