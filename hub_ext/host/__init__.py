"""One machine (`gpupool up`): the command line, the embedded hub's config, Unix accounts, the
users' environment, backup and restore, and the instance check."""
