package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"time"
)

// Dashboard is the part of a dashboard's JSON model that queries touch.
type Dashboard struct {
	UID       string
	Title     string
	Panels    []Panel
	Variables []Variable
}

// Panel is one panel with its queries; rows are flattened away.
type Panel struct {
	ID         int
	Type       string
	Title      string
	Datasource Ref
	Queries    []Query
}

// Ref names a data source.
type Ref struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Query is one target of a panel.
type Query struct {
	RefID      string
	Datasource Ref
	QueryType  string // timeSeries or table
	Format     int    // sqlutil's FormatQueryOption: 0 time series, 1 table
	SQL        string
}

// Variable is a template variable.
type Variable struct {
	Name       string
	Type       string // query or custom
	SQL        string // for query variables
	Values     []string
	IncludeAll bool
	AllValue   string // custom all value, interpolated raw
}

// AllValue is what Grafana selects for "All".
const AllValue = "$__all"

type rawPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *Ref            `json:"datasource"`
	Targets    []rawTarget     `json:"targets"`
	Panels     []rawPanel      `json:"panels"`
	GridPos    json.RawMessage `json:"gridPos"`
}

type rawTarget struct {
	RefID      string `json:"refId"`
	Datasource *Ref   `json:"datasource"`
	EditorType string `json:"editorType"`
	QueryType  string `json:"queryType"`
	Format     *int   `json:"format"`
	RawSQL     string `json:"rawSql"`
}

type rawDashboard struct {
	UID        string     `json:"uid"`
	Title      string     `json:"title"`
	Panels     []rawPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			IncludeAll bool            `json:"includeAll"`
			AllValue   string          `json:"allValue"`
			Options    []struct {
				Value string `json:"value"`
			} `json:"options"`
		} `json:"list"`
	} `json:"templating"`
}

// Load reads a dashboard JSON file.
func Load(path string) (Dashboard, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Dashboard{}, fmt.Errorf("cannot read dashboard: %w", err)
	}
	return Parse(data)
}

// Parse reads a dashboard's JSON model.
func Parse(data []byte) (Dashboard, error) {
	var raw rawDashboard
	if err := json.Unmarshal(data, &raw); err != nil {
		return Dashboard{}, fmt.Errorf("cannot parse dashboard: %w", err)
	}
	if raw.UID == "" || raw.Title == "" {
		return Dashboard{}, errors.New("dashboard has no uid or title")
	}
	d := Dashboard{UID: raw.UID, Title: raw.Title}
	var add func(ps []rawPanel) error
	add = func(ps []rawPanel) error {
		for _, p := range ps {
			if p.Type == "row" {
				if err := add(p.Panels); err != nil {
					return err
				}
				continue
			}
			panel := Panel{ID: p.ID, Type: p.Type, Title: p.Title}
			if p.Datasource != nil {
				panel.Datasource = *p.Datasource
			}
			for _, t := range p.Targets {
				q := Query{RefID: t.RefID, QueryType: t.QueryType, SQL: t.RawSQL, Format: -1}
				if t.Datasource != nil {
					q.Datasource = *t.Datasource
				}
				if t.Format != nil {
					q.Format = *t.Format
				}
				if t.EditorType != "sql" || strings.TrimSpace(t.RawSQL) == "" {
					return fmt.Errorf("panel %d %q, query %s: not a SQL editor query with rawSql", p.ID, p.Title, t.RefID)
				}
				panel.Queries = append(panel.Queries, q)
			}
			d.Panels = append(d.Panels, panel)
		}
		return nil
	}
	if err := add(raw.Panels); err != nil {
		return Dashboard{}, err
	}
	for _, v := range raw.Templating.List {
		vr := Variable{Name: v.Name, Type: v.Type, IncludeAll: v.IncludeAll, AllValue: v.AllValue}
		switch v.Type {
		case "query":
			var q struct {
				RawSQL string `json:"rawSql"`
			}
			var s string
			if err := json.Unmarshal(v.Query, &q); err == nil && q.RawSQL != "" {
				vr.SQL = q.RawSQL
			} else if err := json.Unmarshal(v.Query, &s); err == nil {
				vr.SQL = s
			}
			if strings.TrimSpace(vr.SQL) == "" {
				return Dashboard{}, fmt.Errorf("variable %s has no query", v.Name)
			}
		case "custom":
			for _, o := range v.Options {
				vr.Values = append(vr.Values, o.Value)
			}
			if len(vr.Values) == 0 {
				return Dashboard{}, fmt.Errorf("variable %s has no options", v.Name)
			}
		default:
			return Dashboard{}, fmt.Errorf("variable %s: type %q is not query or custom", v.Name, v.Type)
		}
		d.Variables = append(d.Variables, vr)
	}
	return d, nil
}

// Range is the dashboard's time range and the panel's interval, as Grafana sends them.
type Range struct {
	From, To time.Time
	Interval time.Duration
}

var varRE = regexp.MustCompile(`\$\{(\w+)(?::(\w+))?\}|\$(\w+)`)

// Interpolate replaces template variables as Grafana does before a query is sent:
// ${name}, ${name:singlequote} and $name. values holds each variable's selection;
// AllValue selects "All", which becomes the variable's custom all value, raw, or else every
// one of options[name]. Macros ($__…) are left for Expand.
func Interpolate(sql string, vars []Variable, values, options map[string][]string) (string, error) {
	byName := map[string]Variable{}
	for _, v := range vars {
		byName[v.Name] = v
	}
	var firstErr error
	out := varRE.ReplaceAllStringFunc(sql, func(m string) string {
		sub := varRE.FindStringSubmatch(m)
		name, format := sub[1], sub[2]
		if name == "" {
			name = sub[3]
		}
		if strings.HasPrefix(name, "__") {
			return m // a macro or a global variable: not a template variable
		}
		v, ok := byName[name]
		if !ok {
			if firstErr == nil {
				firstErr = fmt.Errorf("unknown variable $%s", name)
			}
			return m
		}
		sel := values[name]
		if len(sel) == 0 {
			if firstErr == nil {
				firstErr = fmt.Errorf("no value for variable $%s", name)
			}
			return m
		}
		if len(sel) == 1 && sel[0] == AllValue {
			if !v.IncludeAll {
				if firstErr == nil {
					firstErr = fmt.Errorf("variable $%s has no All option", name)
				}
				return m
			}
			if v.AllValue != "" {
				return v.AllValue
			}
			sel = options[name]
			if len(sel) == 0 {
				sel = v.Values
			}
		}
		switch format {
		case "", "raw", "csv":
			return strings.Join(sel, ",")
		case "singlequote":
			q := make([]string, len(sel))
			for i, s := range sel {
				q[i] = "'" + strings.ReplaceAll(s, "'", `\'`) + "'"
			}
			return strings.Join(q, ",")
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("variable format %q of $%s is not supported here", format, name)
		}
		return m
	})
	return out, firstErr
}

var macroRE = regexp.MustCompile(`\$__(\w+)(?:\(([^()]*)\))?`)

// Expand replaces the ClickHouse plugin's macros the way grafana-clickhouse-datasource does
// (pkg/macros) and fails on a macro it does not know or anything left starting with $.
func Expand(sql string, r Range) (string, error) {
	dt := func(t time.Time) string { return fmt.Sprintf("toDateTime(%d)", t.Unix()) }
	dt64 := func(t time.Time) string { return fmt.Sprintf("fromUnixTimestamp64Milli(%d)", t.UnixMilli()) }
	date := func(t time.Time) string { return fmt.Sprintf("toDate('%s')", t.UTC().Format("2006-01-02")) }
	var firstErr error
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	out := macroRE.ReplaceAllStringFunc(sql, func(m string) string {
		sub := macroRE.FindStringSubmatch(m)
		name := sub[1]
		hasArgs := strings.Contains(m, "(")
		var args []string
		if hasArgs {
			for _, a := range strings.Split(sub[2], ",") {
				args = append(args, strings.TrimSpace(a))
			}
		}
		one := func() (string, bool) {
			if len(args) != 1 || args[0] == "" {
				fail(fmt.Errorf("$__%s needs one argument, got %q", name, sub[2]))
				return "", false
			}
			return args[0], true
		}
		switch name {
		case "fromTime", "toTime", "fromTime_ms", "toTime_ms", "interval_s":
			if hasArgs {
				// The plugin takes no arguments here; parentheses would be left in the SQL.
				fail(fmt.Errorf("$__%s takes no arguments", name))
				return m
			}
		}
		switch name {
		case "fromTime":
			return dt(r.From)
		case "toTime":
			return dt(r.To)
		case "fromTime_ms":
			return dt64(r.From)
		case "toTime_ms":
			return dt64(r.To)
		case "interval_s":
			return fmt.Sprintf("%d", int(math.Max(r.Interval.Seconds(), 1)))
		case "timeFilter":
			if c, ok := one(); ok {
				return fmt.Sprintf("%s >= %s AND %s <= %s", c, dt(r.From), c, dt(r.To))
			}
		case "timeFilter_ms":
			if c, ok := one(); ok {
				return fmt.Sprintf("%s >= %s AND %s <= %s", c, dt64(r.From), c, dt64(r.To))
			}
		case "dateFilter":
			if c, ok := one(); ok {
				return fmt.Sprintf("%s >= %s AND %s <= %s", c, date(r.From), c, date(r.To))
			}
		case "timeInterval":
			if c, ok := one(); ok {
				return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)", c, int(math.Max(r.Interval.Seconds(), 1)))
			}
		default:
			fail(fmt.Errorf("unknown macro $__%s", name))
		}
		return m
	})
	if firstErr != nil {
		return "", firstErr
	}
	if i := strings.IndexByte(out, '$'); i >= 0 {
		end := min(i+30, len(out))
		return "", fmt.Errorf("unexpanded %q", out[i:end])
	}
	return out, nil
}
