module github.com/tokenscope/tokenscope/schemas

go 1.26
