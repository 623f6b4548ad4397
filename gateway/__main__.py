"""`python -m gateway` (from a checkout), `python -m model_gateway.gateway`, and the entry
point of the single binary built by `make dist`."""

import sys

from model_gateway.gateway.sandbox.child import FROZEN_CHILD_ARG

if sys.argv[1:2] == [FROZEN_CHILD_ARG]:
    from model_gateway.gateway.sandbox.supervisor import run_child

    run_child(sys.argv[2:])  # the binary, started again as its own spawned sandbox node
else:
    from model_gateway.gateway.cli import main

    raise SystemExit(main())
