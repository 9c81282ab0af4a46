package chdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Features are the DDL features the migrator uses only where the server has them.
type Features struct {
	LowCardinality bool // a column type without experimental settings (19.0; experimental in 18.12–18.16)
	DateTime64     bool // a column type (20.1)
	TTL            bool // table TTL of MergeTree (19.6)
}

// A probe asks the server for one feature: the server accepting the statement means it has
// the feature; refusing it (an exception) means it does not.
type probe struct {
	feature string
	sql     string
	set     func(*Features)
}

// Temporary tables live in the connection's session and need no database; IF NOT EXISTS
// keeps a probe repeated on a pooled connection from failing on the table of the last one.
var probes = []probe{
	{"LowCardinality", "CREATE TEMPORARY TABLE IF NOT EXISTS tokenscope_probe_lc (v LowCardinality(String))", func(f *Features) { f.LowCardinality = true }},
	{"DateTime64", "CREATE TEMPORARY TABLE IF NOT EXISTS tokenscope_probe_dt64 (v DateTime64(3, 'UTC'))", func(f *Features) { f.DateTime64 = true }},
	// A TTL cannot be tried without creating a MergeTree table; every server that
	// implements TTL has the MergeTree setting that schedules TTL merges.
	{"TTL", "SELECT throwIf(count() = 0) FROM system.merge_tree_settings WHERE name = 'merge_with_ttl_timeout'", func(f *Features) { f.TTL = true }},
}

// Probe learns which Features the server has by trying each: exec runs one statement and
// returns nil when the server accepted it, a *clickhouse.Exception when the server refused
// it, and any other error when it could not ask (which Probe returns: a feature must never
// be taken as missing because the connection failed).
func Probe(ctx context.Context, exec func(ctx context.Context, sql string) error) (Features, error) {
	var f Features
	for _, p := range probes {
		err := exec(ctx, p.sql)
		var ex *clickhouse.Exception
		switch {
		case err == nil:
			p.set(&f)
		case errors.As(err, &ex):
		default:
			return f, fmt.Errorf("cannot probe the server for %s: %w", p.feature, err)
		}
	}
	for _, t := range []string{"tokenscope_probe_lc", "tokenscope_probe_dt64"} {
		_ = exec(ctx, "DROP TEMPORARY TABLE IF EXISTS "+t) // on another pooled connection, harmless
	}
	return f, nil
}

// Features probes the server for the features the migrator uses.
func (d *DB) Features(ctx context.Context) (Features, error) {
	return Probe(ctx, nativeExecutor{d.conn}.Exec)
}
