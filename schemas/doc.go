// Package schemas embeds tokenscope's message schemas (JSON Schema, draft 2020-12) and
// ClickHouse DDL, so that Go code validates against, and migrates to, exactly the files
// other languages read.
package schemas

import (
	"embed"
	"io/fs"
)

// JSON holds the message schemas: request_event, gpu_sample, engine_sample, token_rollup, gpu_rollup, engine_rollup,
// rollup_watermark and alert, each as <name>.schema.json.
//
//go:embed *.schema.json
var JSON embed.FS

// ClickHouse holds the DDL under clickhouse/, applied in file-name order by the migrator.
//
//go:embed clickhouse/*.sql
var ClickHouse embed.FS

// Queries holds the SQL cookbook under clickhouse/queries/: tested example queries with
// {name:Type} parameters, as clickhouse-client's --param_name fills them (and, for servers
// that cannot, tokenscope report --sql FILE --param name=value).
//
//go:embed clickhouse/queries/*.sql
var Queries embed.FS

// Migrations returns the DDL files at the root of a file system, as chdb's Migrate reads
// them.
func Migrations() fs.FS {
	sub, _ := fs.Sub(ClickHouse, "clickhouse") // a constant, valid path: Sub cannot fail
	return sub
}
