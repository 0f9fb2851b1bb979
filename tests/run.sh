#!/usr/bin/env bash
# The whole test suite (lint, types, unit, integration, acceptance), in the project's own
# environment: installs the system tools the tests use (as root; otherwise names them) and
# traind[s3,ssh,hf,train,launch,test] into .venv, then runs ruff, mypy and pytest. Arguments go
# to pytest (bash tests/run.sh tests/unit -x).
set -euo pipefail
source "$(dirname "$0")/support/venv.sh"
system_tools
project_venv s3,ssh,hf,train,launch,test
cd "$TRAIND_ROOT"
ruff check . && mypy && python -m pytest "$@"
