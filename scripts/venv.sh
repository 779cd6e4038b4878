# Sourced by demo.sh and test.sh: a project venv in .venv with specops (editable) and its test tools.
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
PY=$PWD/.venv/bin/python
