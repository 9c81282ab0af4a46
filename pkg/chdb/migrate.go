package chdb

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

const ledgerDDL = `CREATE TABLE IF NOT EXISTS schema_migrations
(
    name       String,
    checksum   String,
    applied_at DateTime
)
ENGINE = MergeTree
ORDER BY name`

// Executor runs statements on a server: what the migrator needs of a connection.
type Executor interface {
	// Exec runs a statement; a refusal by the server is a *clickhouse.Exception.
	Exec(ctx context.Context, sql string) error
	// Strings runs a query and returns its first column as text.
	Strings(ctx context.Context, sql string) ([]string, error)
	// Insert inserts one row: insert is "INSERT INTO table (columns…)", row their values.
	Insert(ctx context.Context, insert string, row ...any) error
}

// Migration is what Migrate found and did.
type Migration struct {
	// Features are what the server was found to have; the DDL was rendered for them.
	Features Features
	// Applied are the migrations that ran now and were recorded, in order. A migration
	// whose every table already existed is recorded but not listed here.
	Applied []string
	// Created are the tables the applied migrations created.
	Created []string
	// Existing are the tables the migrations would have created that were already there
	// (created by hand, such as a cluster's Distributed tables): left as they were.
	Existing []Table
	// Added are the columns the applied migrations added, as table.column; a column already
	// there is not listed.
	Added []string
}

// Table is a table a migration creates.
type Table struct {
	Name      string
	Engine    string // as system.tables names it: MergeTree, Distributed, ReplicatedMergeTree…
	Migration string
}

func (t Table) String() string { return t.Name + " (" + t.Engine + ")" }

// Migrate applies, in name order, every *.sql file at the root of fsys that the
// schema_migrations table does not list yet, rendered for the features the server is found
// to have (Probe). Each file is a text/template (see Render) of statements separated by
// ";" at the end of a line; every statement must be idempotent (IF NOT EXISTS), so two
// services migrating at once are safe. A CREATE TABLE IF NOT EXISTS of a table that is
// already there is not run: the table is reported in Existing with its engine.
//
// ALTER TABLE t ADD COLUMN IF NOT EXISTS c … runs only when system.columns lacks t.c, and
// without IF NOT EXISTS, which 18.16 cannot parse; a failure after which the column is
// there is another migrator's doing and not an error. On a Distributed table the column is
// added only when this node's table under it already has it: the Distributed table would
// otherwise take inserts the shards refuse, so the migration fails, saying what to run on
// every node first, and runs again at the next start.
func (d *DB) Migrate(ctx context.Context, fsys fs.FS) (Migration, error) {
	return MigrateOn(ctx, nativeExecutor{d.conn}, d.name, d.version.String(), fsys)
}

// MigrateOn is Migrate on any connection to database db; server names the server in errors.
func MigrateOn(ctx context.Context, x Executor, db, server string, fsys fs.FS) (Migration, error) {
	var m Migration
	f, err := Probe(ctx, x.Exec)
	if err != nil {
		return m, err
	}
	m.Features = f
	if err := x.Exec(ctx, ledgerDDL); err != nil {
		return m, fmt.Errorf("cannot create schema_migrations: %w", err)
	}
	recorded, err := x.Strings(ctx, "SELECT DISTINCT name FROM schema_migrations")
	if err != nil {
		return m, fmt.Errorf("cannot read schema_migrations: %w", err)
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return m, fmt.Errorf("cannot list migrations: %w", err)
	}
	slices.Sort(names)
	for _, name := range names {
		if slices.Contains(recorded, name) {
			continue
		}
		raw, err := fs.ReadFile(fsys, name)
		if err != nil {
			return m, fmt.Errorf("cannot read migration %s: %w", name, err)
		}
		sql, err := Render(name, string(raw), f)
		if err != nil {
			return m, err
		}
		ran := false
		for i, stmt := range Statements(sql) {
			if add := addedColumn(stmt); add != nil {
				added, err := addColumn(ctx, x, db, add)
				if err != nil {
					return m, fmt.Errorf("cannot apply migration %s (statement %d) on ClickHouse %s: %w", name, i+1, server, err)
				}
				if added {
					m.Added = append(m.Added, add.table+"."+add.column)
					ran = true
				}
				continue
			}
			if table := createdTable(stmt); table != "" {
				engine, err := x.Strings(ctx, "SELECT engine FROM system.tables WHERE database = "+Quote(db)+" AND name = "+Quote(table))
				if err != nil {
					return m, fmt.Errorf("cannot look for table %s: %w", table, err)
				}
				if len(engine) > 0 {
					m.Existing = append(m.Existing, Table{Name: table, Engine: engine[0], Migration: name})
					continue
				}
				m.Created = append(m.Created, table)
			}
			if err := x.Exec(ctx, stmt); err != nil {
				return m, fmt.Errorf("cannot apply migration %s (statement %d) on ClickHouse %s: %w", name, i+1, server, err)
			}
			ran = true
		}
		sum := sha256.Sum256(raw)
		if err := x.Insert(ctx, "INSERT INTO schema_migrations (name, checksum, applied_at)", name, hex.EncodeToString(sum[:]), time.Now().UTC().Truncate(time.Second)); err != nil {
			return m, fmt.Errorf("cannot record migration %s: %w", name, err)
		}
		if ran {
			m.Applied = append(m.Applied, name)
		}
	}
	return m, nil
}

var createRE = regexp.MustCompile(`(?is)^CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)[\s(]`)

// createdTable returns the table a CREATE TABLE IF NOT EXISTS statement creates, or "".
func createdTable(stmt string) string {
	if m := createRE.FindStringSubmatch(stmt); m != nil {
		return m[1]
	}
	return ""
}

var addColumnRE = regexp.MustCompile(`(?is)^(ALTER\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)\s+ADD\s+COLUMN\s+)IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)(\s.*)$`)

// columnAdd is an ALTER TABLE … ADD COLUMN IF NOT EXISTS statement.
type columnAdd struct {
	table, column string
	plain         string // the statement without IF NOT EXISTS
}

// addedColumn parses an ALTER TABLE t ADD COLUMN IF NOT EXISTS c statement, or returns nil.
func addedColumn(stmt string) *columnAdd {
	m := addColumnRE.FindStringSubmatch(stmt)
	if m == nil {
		return nil
	}
	return &columnAdd{table: m[2], column: m[3], plain: m[1] + m[3] + m[4]}
}

// distributedRE reads the database and table a Distributed engine reads from its engine_full.
var distributedRE = regexp.MustCompile(`^Distributed\(\s*'?[A-Za-z0-9_]+'?\s*,\s*'?([A-Za-z0-9_]+)'?\s*,\s*'?([A-Za-z0-9_]+)'?`)

// addColumn adds the column unless the table has it; it reports whether it added it.
func addColumn(ctx context.Context, x Executor, db string, a *columnAdd) (bool, error) {
	has := func(db, table string) (bool, error) {
		n, err := x.Strings(ctx, "SELECT name FROM system.columns WHERE database = "+Quote(db)+" AND table = "+Quote(table)+" AND name = "+Quote(a.column))
		if err != nil {
			return false, fmt.Errorf("cannot look for column %s.%s: %w", table, a.column, err)
		}
		return len(n) > 0, nil
	}
	if ok, err := has(db, a.table); err != nil || ok {
		return false, err
	}
	engine, err := x.Strings(ctx, "SELECT engine_full FROM system.tables WHERE database = "+Quote(db)+" AND name = "+Quote(a.table))
	if err != nil {
		return false, fmt.Errorf("cannot look for table %s: %w", a.table, err)
	}
	if len(engine) > 0 {
		if d := distributedRE.FindStringSubmatch(engine[0]); d != nil {
			ok, err := has(d[1], d[2])
			if err != nil {
				return false, err
			}
			if !ok {
				return false, fmt.Errorf("%s is a Distributed table over %s.%s, which has no column %s on this node: add it to that table on every node first (%s), then start again",
					a.table, d[1], d[2], a.column, strings.Replace(a.plain, a.table, d[1]+"."+d[2], 1))
			}
		}
	}
	if err := x.Exec(ctx, a.plain); err != nil {
		if ok, herr := has(db, a.table); herr == nil && ok {
			return false, nil // another migrator added it meanwhile
		}
		return false, err
	}
	return true, nil
}

// nativeExecutor is an Executor over clickhouse-go.
type nativeExecutor struct{ conn driver.Conn }

func (n nativeExecutor) Exec(ctx context.Context, sql string) error { return n.conn.Exec(ctx, sql) }

// Insert uses a batch, not INSERT … VALUES, which 18.16 never answers over the native
// protocol.
func (n nativeExecutor) Insert(ctx context.Context, insert string, row ...any) error {
	b, err := n.conn.PrepareBatch(ctx, insert)
	if err != nil {
		return err
	}
	if err := b.Append(row...); err != nil {
		return err
	}
	return b.Send()
}

func (n nativeExecutor) Strings(ctx context.Context, sql string) ([]string, error) {
	rows, err := n.conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Render fills in a migration's template for a server with the given features:
//
//	{{lc "String"}}   LowCardinality(String), or String
//	{{dt64 3}}        DateTime64(3, 'UTC'), or DateTime
//	{{ttl "ts" 30}}   TTL toDateTime(ts) + INTERVAL 30 DAY, or nothing
func Render(name, text string, f Features) (string, error) {
	funcs := template.FuncMap{
		"lc": func(t string) string {
			if f.LowCardinality {
				return "LowCardinality(" + t + ")"
			}
			return t
		},
		"dt64": func(precision int) string {
			if f.DateTime64 {
				return fmt.Sprintf("DateTime64(%d, 'UTC')", precision)
			}
			return "DateTime"
		},
		"ttl": func(col string, days int) string {
			if f.TTL {
				return fmt.Sprintf("TTL toDateTime(%s) + INTERVAL %d DAY", col, days)
			}
			return ""
		},
	}
	tmpl, err := template.New(path.Base(name)).Funcs(funcs).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("cannot parse migration %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, nil); err != nil {
		return "", fmt.Errorf("cannot render migration %s: %w", name, err)
	}
	return b.String(), nil
}

// Statements splits rendered SQL into statements at ";" that ends a line, dropping
// comment-only lines and empty statements.
func Statements(sql string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for _, line := range strings.Split(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		if strings.HasSuffix(trimmed, ";") {
			cur.WriteString(strings.TrimSuffix(trimmed, ";"))
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return out
}

// Log says what Migrate did and found, when it did or found anything: the migrations applied,
// the tables created, and the tables that already existed, with their engines.
func (m Migration) Log(logger *slog.Logger, server Version) {
	if len(m.Applied)+len(m.Created)+len(m.Existing)+len(m.Added) == 0 {
		return
	}
	existing := make([]string, len(m.Existing))
	for i, t := range m.Existing {
		existing[i] = t.String()
	}
	logger.Info("migrated ClickHouse", "server", server.String(), "features", fmt.Sprintf("%+v", m.Features),
		"applied", m.Applied, "created", m.Created, "added", m.Added, "existing", existing)
}
