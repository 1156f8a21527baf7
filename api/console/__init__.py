"""The web console for security teams and tenant admins, served by the management API (/console).

Server-rendered (FastAPI + Jinja2), no JavaScript needed; see docs/console.md.
"""
