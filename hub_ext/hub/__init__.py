"""The running JupyterHub as gpupool's parts use it: the one adapter to the hub's application, gpupool's
own templates, background tasks, stopping, quiet refusals, crash points and log redaction."""
