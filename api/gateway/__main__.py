"""`python -m api.gateway`: the control plane's HTTP server (`api/serve.py`), under the name
`sealed up`, deployments and docs have always used. This entry point is the one import from the
gateway package to the composed app (an allowed exception in pyproject's import contracts)."""

from api.serve import main

if __name__ == "__main__":
    raise SystemExit(main())
