package events_test

import (
	"encoding/json"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestAlertMatchesSchema: what the alerter publishes passes alert.schema.json, firing and
// resolved for each reason; every field of events.Alert is a property of the schema, the
// reasons are the schema's enum, and a reason on a firing alert, or an unknown one, is
// rejected. The schema let a firing alert carry a resolve_reason.
func TestAlertMatchesSchema(t *testing.T) {
	sch := compileSchema(t, "alert.schema.json")
	raw, err := fs.ReadFile(schemas.JSON, "alert.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Properties map[string]struct {
			Enum []string `json:"enum"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[events.Alert]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if _, ok := doc.Properties[name]; !ok {
			t.Errorf("events.Alert field %s (%q) is not a property of the schema", typ.Field(i).Name, name)
		}
	}
	reasons := []string{events.ResolvedNormal, events.ResolvedSilent, events.ResolvedWithinSLA}
	if got := slices.Sorted(slices.Values(doc.Properties["resolve_reason"].Enum)); !slices.Equal(got, slices.Sorted(slices.Values(reasons))) {
		t.Errorf("schema resolve_reason enum %v, want %v", got, reasons)
	}

	at := time.Date(2026, 3, 3, 12, 5, 0, 0, time.UTC)
	firing := events.Alert{V: 1, Fingerprint: "f", Rule: "ttft_p95_dynamic", State: events.AlertFiring, Severity: events.SeverityWarning,
		Labels: map[string]string{"alertname": "ttft_p95_dynamic", "severity": "warning"}, Value: 150, Threshold: 100,
		BaselineMethod: "median_mad", BaselineCenter: 50, BaselineSpread: 25, WindowStart: at.Add(-2 * time.Minute),
		StartsAt: at.Add(-time.Minute), At: at.Add(-time.Minute), Summary: "ttft_p95_dynamic firing: 150 above 100"}
	check := func(name string, a events.Alert, valid bool) {
		t.Helper()
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateSchema(sch, b); (err == nil) != valid {
			t.Errorf("%s: schema says %v, want valid %v: %s", name, err, valid, b)
		}
	}
	check("firing", firing, true)
	for _, r := range reasons {
		a := firing
		a.State, a.EndsAt, a.At, a.ResolveReason = events.AlertResolved, at, at, r
		check("resolved "+r, a, true)
	}
	bogus := firing
	bogus.State, bogus.EndsAt, bogus.ResolveReason = events.AlertResolved, at, "gone"
	check("an unknown reason", bogus, false)
	wrong := firing
	wrong.ResolveReason = events.ResolvedNormal
	check("a reason on a firing alert", wrong, false)
}
