package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != "127.0.0.1:9104" || cfg.Slot != 30*time.Minute || cfg.Resend != time.Hour || cfg.BaselineDays != 7 ||
		cfg.NATS.URL != "nats://127.0.0.1:4222" || cfg.ClickHouse.Addr != "127.0.0.1:9000" || !cfg.SplitWeekends ||
		cfg.WatermarkTimeout != time.Minute || cfg.RowsConsumer != "alerter-rows" || cfg.MaxSeries != 100000 {
		t.Errorf("defaults %+v", cfg)
	}
}

func TestConfigNamesTheBadVariable(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"ALERTER_SLOT": "soon"}, "ALERTER_SLOT"},
		{map[string]string{"ALERTER_SLOT": "7h"}, "ALERTER_SLOT"},
		{map[string]string{"ALERTER_RESEND": "10s"}, "ALERTER_RESEND"},
		{map[string]string{"ALERTER_TIMEZONE": "Mars/Olympus"}, "ALERTER_TIMEZONE"},
		{map[string]string{"ALERTER_BASELINE_STEP": "7m"}, "ALERTER_BASELINE_STEP"},
		{map[string]string{"ALERTER_BASELINE_DAYS": "0"}, "ALERTER_BASELINE_DAYS"},
		{map[string]string{"ALERTER_ALERTMANAGER_URL": "am:9093"}, "ALERTER_ALERTMANAGER_URL"},
		{map[string]string{"ALERTER_CONSUMER": "a.b"}, "ALERTER_CONSUMER"},
		{map[string]string{"ALERTER_ROWS_CONSUMER": "a b"}, "ALERTER_ROWS_CONSUMER"},
		{map[string]string{"ALERTER_WATERMARK_TIMEOUT": "-1s"}, "ALERTER_WATERMARK_TIMEOUT"},
		{map[string]string{"ALERTER_LOG_LEVEL": "loud"}, "ALERTER_LOG_LEVEL"},
		{map[string]string{"ALERTER_MAX_SERIES": "-1"}, "ALERTER_MAX_SERIES"},
		{map[string]string{"NATS_URL": "::"}, "NATS_URL"},
		{map[string]string{"CLICKHOUSE_DB": "a-b"}, "CLICKHOUSE_DB"},
	} {
		_, err := parseConfig(func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to name %s", tc.env, err, tc.want)
		}
	}
}

// TestConfigHidesTheAlertmanagerPassword: a bad ALERTER_ALERTMANAGER_URL is named without
// the password it may hold.
func TestConfigHidesTheAlertmanagerPassword(t *testing.T) {
	for _, v := range []string{"ftp://am:s3cret@am:9093", "am:s3cret@am:9093", "http://am:s3cret@am:port", "http://am:s3cret@", "ftp://am/?api_key=s3cret"} {
		_, err := parseConfig(func(k string) string { return map[string]string{"ALERTER_ALERTMANAGER_URL": v}[k] })
		if err == nil || !strings.Contains(err.Error(), "ALERTER_ALERTMANAGER_URL") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: err = %v", v, err)
		}
	}
}

func TestRunStopsOnABadRulesFile(t *testing.T) {
	path := t.TempDir() + "/rules.yaml"
	if err := writeFile(path, "scenes:\n  chat:\n    dynamic:\n      ttft_p95: {k: 0}\n"); err != nil {
		t.Fatal(err)
	}
	err := run(t.Context(), func(k string) string { return map[string]string{"ALERTER_RULES": path}[k] }, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "scenes.chat.dynamic.ttft_p95.k") {
		t.Errorf("err = %v, want it to name the rule and field", err)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }
