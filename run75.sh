export PYTHONPATH=$PWD/python:$PWD/bridge PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 bench/extras.py $R --budget-s 150 > $R/extras_run75.log 2>&1
echo "extras rc=$?"; tail -5 $R/extras_run75.log; ls $R
