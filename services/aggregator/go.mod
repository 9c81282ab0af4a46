module github.com/tokenscope/tokenscope/services/aggregator

go 1.26

require (
	github.com/tokenscope/tokenscope/pkg v0.0.0
	github.com/tokenscope/tokenscope/schemas v0.0.0
)

replace github.com/tokenscope/tokenscope/pkg => ../../pkg

replace github.com/tokenscope/tokenscope/schemas => ../../schemas
