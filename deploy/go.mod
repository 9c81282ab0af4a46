module github.com/tokenscope/tokenscope/deploy

go 1.26.0

replace github.com/tokenscope/tokenscope/pkg => ../pkg

replace github.com/tokenscope/tokenscope/schemas => ../schemas

require github.com/compose-spec/compose-go/v2 v2.16.2 // indirect
