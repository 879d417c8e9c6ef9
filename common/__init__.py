"""What the worker and the API share: config, event model, key schema, ranking rules, Lua."""
