module rankstream/bench/rate

go 1.21
