# Sourced by demo.sh and test.sh: a project venv in .venv with specops and its simulator (specops-gpusim, simulator/), both editable, and the test tools.
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' -e ./simulator
PY=$PWD/.venv/bin/python
