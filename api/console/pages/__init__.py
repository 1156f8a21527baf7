"""The console's pages by domain, each with its routes under /console: sign-in, audit, workers,
keys, usage, policies. ``api.console.router.install`` serves them all."""
