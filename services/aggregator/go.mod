module github.com/tokenscope/tokenscope/services/aggregator

go 1.26.0

require (
	github.com/tokenscope/tokenscope/pkg v0.0.0
	github.com/tokenscope/tokenscope/schemas v0.0.0
)

require github.com/influxdata/tdigest v0.0.1 // indirect

replace github.com/tokenscope/tokenscope/pkg => ../../pkg

replace github.com/tokenscope/tokenscope/schemas => ../../schemas
