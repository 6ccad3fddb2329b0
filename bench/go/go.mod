module osftrt-bench

go 1.19

require libosftrt v0.0.0

replace libosftrt => ../../bindings/go
