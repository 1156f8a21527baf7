"""Management API: tenants, API keys, model versions, rollouts, usage, policies (JWT roles)."""
