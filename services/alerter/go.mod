module github.com/tokenscope/tokenscope/services/alerter

go 1.26.0

require (
	github.com/influxdata/tdigest v0.0.1
	github.com/tokenscope/tokenscope/pkg v0.0.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/tokenscope/tokenscope/schemas v0.0.0 // indirect
)

replace github.com/tokenscope/tokenscope/pkg => ../../pkg

replace github.com/tokenscope/tokenscope/schemas => ../../schemas
