"""Design experiments: measurements that choose between designs before one is built, each a
module run on its own (`python -m bench.designs.<name>`), printing its figures. Not part of
`make bench`, whose benchmarks measure what is built."""
