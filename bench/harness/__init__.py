"""The harness every benchmark runs on, one module per piece:

- `stack`: a private Kafka and Redis for one run;
- `processes`: the child processes a benchmark starts, stopped in order however it ends;
- `nodes`: `rankstream worker` and `rankstream api` processes on a stack, and their probes;
- `probes`: plain HTTP GETs against what runs (readiness, JSON answers);
- `kafka`: the bench's own bulk producer (plain, or held back in one transaction);
- `fill`: a board filled through the worker's own write path;
- `cpu`: CPU% of named processes (/proc), and of a load tool run to its end;
- `wrk`, `rate`, `bare`: the load generators (wrk rounds, with a Lua script or not; a
  constant-rate client without coordinated omission) and the bare aiohttp baseline they are
  compared against;
- `http1`: the bench's own HTTP/1.1 client pieces (pre-encoded requests, request files, a
  keep-alive connection);
- `stats`: percentiles and ratios;
- `report`: run metadata, goals met, the printed table and the JSON file.
"""
