"""`python -m api.orchestrator`: the Kubernetes controller (see api/orchestrator/kube.py)."""

from api.orchestrator.kube import main

raise SystemExit(main())
