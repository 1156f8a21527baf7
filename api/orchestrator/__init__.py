"""The control loop that runs workers for model versions: one design, two runtimes.

`spec` (what a version wants, from `GET /admin/v1/deployments`), `scaling` (how many replicas, from
load), `reconcile` (pure: wanted vs running -> actions), `local` (worker processes under the
one-host supervisor), `kube` (a Deployment per version through the `kubernetes` client), `loop`
(poll, reconcile, apply, report status back to the gateway).
"""
