module libosftrt

go 1.19
