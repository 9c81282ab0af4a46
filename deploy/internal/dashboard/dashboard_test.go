package dashboard

import (
	"strings"
	"testing"
	"time"
)

func TestExpand(t *testing.T) {
	r := Range{From: time.Unix(1700000000, 0), To: time.Unix(1700003600, 500e6), Interval: 30 * time.Second}
	tests := []struct {
		name, in, want, wantErr string
	}{
		{name: "time filter", in: "WHERE $__timeFilter(window_start)", want: "WHERE window_start >= toDateTime(1700000000) AND window_start <= toDateTime(1700003600)"},
		{name: "from to", in: "$__toTime - $__fromTime", want: "toDateTime(1700003600) - toDateTime(1700000000)"},
		{name: "ms", in: "$__timeFilter_ms(at)", want: "at >= fromUnixTimestamp64Milli(1700000000000) AND at <= fromUnixTimestamp64Milli(1700003600500)"},
		{name: "interval", in: "greatest($__interval_s, 60)", want: "greatest(30, 60)"},
		{name: "time interval", in: "$__timeInterval(ts)", want: "toStartOfInterval(toDateTime(ts), INTERVAL 30 second)"},
		{name: "date", in: "$__dateFilter(d)", want: "d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')"},
		{name: "unknown macro", in: "$__nope(x)", wantErr: "unknown macro"},
		{name: "no argument", in: "$__timeFilter()", wantErr: "needs one argument"},
		{name: "args on a value macro", in: "$__fromTime(x)", wantErr: "takes no arguments"},
		{name: "leftover variable", in: "model = $model", wantErr: "unexpanded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Expand(tt.in, r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestInterpolate(t *testing.T) {
	vars := []Variable{
		{Name: "model", Type: "query", IncludeAll: true, AllValue: "'__all__'"},
		{Name: "env", Type: "query", IncludeAll: true},
		{Name: "q", Type: "custom", Values: []string{"0.5", "0.95"}},
	}
	opts := map[string][]string{"env": {"dev", "prod"}}
	tests := []struct {
		name    string
		in      string
		values  map[string][]string
		want    string
		wantErr string
	}{
		{name: "singlequote", in: "model IN (${model:singlequote})", values: map[string][]string{"model": {"a", "it's"}}, want: `model IN ('a','it\'s')`},
		{name: "custom all value is raw", in: "IN (${model:singlequote})", values: map[string][]string{"model": {AllValue}}, want: "IN ('__all__')"},
		{name: "all without custom value", in: "IN (${env:singlequote})", values: map[string][]string{"env": {AllValue}}, want: "IN ('dev','prod')"},
		{name: "plain", in: "quantile($q)($__fromTime)", values: map[string][]string{"q": {"0.95"}}, want: "quantile(0.95)($__fromTime)"},
		{name: "unknown", in: "$nope", wantErr: "unknown variable"},
		{name: "no value", in: "$q", wantErr: "no value"},
		{name: "no all option", in: "$q", values: map[string][]string{"q": {AllValue}}, wantErr: "no All option"},
		{name: "bad format", in: "${q:json}", values: map[string][]string{"q": {"1"}}, wantErr: "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Interpolate(tt.in, vars, tt.values, opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	good := `{"uid":"u","title":"t","panels":[{"type":"row","panels":[{"id":2,"type":"table","title":"in row","targets":[{"refId":"A","editorType":"sql","rawSql":"SELECT 1"}]}]},
		{"id":3,"type":"stat","title":"top","datasource":{"type":"x","uid":"ds"},"targets":[{"refId":"A","editorType":"sql","format":1,"rawSql":"SELECT 2"}]}],
		"templating":{"list":[{"name":"m","type":"query","query":{"rawSql":"SELECT DISTINCT m FROM t"}},{"name":"s","type":"query","query":"SELECT 1"},
		{"name":"q","type":"custom","options":[{"value":"0.5"}]}]}}`
	d, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Panels) != 2 || d.Panels[0].Title != "in row" || d.Panels[1].Datasource.UID != "ds" || d.Panels[1].Queries[0].Format != 1 {
		t.Fatalf("panels %+v", d.Panels)
	}
	if len(d.Variables) != 3 || d.Variables[0].SQL != "SELECT DISTINCT m FROM t" || d.Variables[1].SQL != "SELECT 1" || d.Variables[2].Values[0] != "0.5" {
		t.Fatalf("variables %+v", d.Variables)
	}
	for name, bad := range map[string]string{
		"not json":       `{`,
		"no uid":         `{"title":"t"}`,
		"builder query":  `{"uid":"u","title":"t","panels":[{"id":1,"type":"table","targets":[{"refId":"A","editorType":"builder"}]}]}`,
		"empty variable": `{"uid":"u","title":"t","templating":{"list":[{"name":"m","type":"query","query":""}]}}`,
		"other variable": `{"uid":"u","title":"t","templating":{"list":[{"name":"m","type":"interval"}]}}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
