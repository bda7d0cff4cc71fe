"""The training pool in the hub process: config, scheduling loop, runner glue."""
