"""Where the GPU-hours go: usage accounting over the event log, GPU-hour budgets and
right-sizing advice. `accounting`, `budgets` and `rightsizing` are pure; `ledger` reads the
store, `service` puts them together for the API, the admin page and the spawner."""
