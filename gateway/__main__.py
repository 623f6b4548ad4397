"""`python -m gateway` (from a checkout), `python -m model_gateway.gateway`, and the entry
point of the single binary built by `make dist`."""

import sys

from model_gateway.gateway.ops.children import LOG_PROCESS_ARG, SANDBOX_NODE_ARG, WORKER_ARG

if sys.argv[1:2] == [SANDBOX_NODE_ARG]:
    from model_gateway.gateway.sandbox import supervisor

    supervisor.run_child(sys.argv[2:])  # the binary, started again as its spawned sandbox node
elif sys.argv[1:2] == [LOG_PROCESS_ARG]:
    from model_gateway.gateway.proofs import log_process

    log_process.run_child()  # the binary, started again as its log process
elif sys.argv[1:2] == [WORKER_ARG]:
    from model_gateway.gateway.ops import worker

    worker.run_child()  # the binary, started again as one of `serve --workers N`
else:
    from model_gateway.gateway.cli import main

    raise SystemExit(main())
