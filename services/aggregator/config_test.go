package main

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(envVars{}.get)
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Agg
	if a.Window != 15*time.Second || a.Lateness != 30*time.Second || a.Buckets != "0,500,2000,8000,32000" ||
		!a.StoreRequests || a.LeaseTTL != 15*time.Second || a.Filter != "llm.req.>" || cfg.HTTPAddr != "127.0.0.1:9103" || cfg.ClickHouse.DB != "tokenscope" {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	for _, tc := range []struct {
		vars envVars
		want string
	}{
		{envVars{"AGG_WINDOW": "1500ms"}, "AGG_WINDOW"},
		{envVars{"AGG_WINDOW": "soon"}, "AGG_WINDOW"},
		{envVars{"AGG_WINDOW": "25h"}, "AGG_WINDOW"}, // the alerter takes windows of a day at most
		{envVars{"AGG_LATENESS": "-1s"}, "AGG_LATENESS"},
		{envVars{"AGG_BUCKETS": "0,500,100"}, "AGG_BUCKETS"},
		{envVars{"AGG_MAX_SERIES": "0"}, "AGG_MAX_SERIES"},
		{envVars{"AGG_CONSUMER": "a.b"}, "AGG_CONSUMER"},
		{envVars{"AGG_CONSUMER": "a/b"}, "AGG_CONSUMER"},
		{envVars{"AGG_CONSUMER": "aggé"}, "AGG_CONSUMER"},
		{envVars{"AGG_CONSUMER": strings.Repeat("a", 65)}, "AGG_CONSUMER"},
		{envVars{"AGG_LEASE_TTL": "500ms"}, "AGG_LEASE_TTL=500ms"},
		{envVars{"AGG_LEASE_TTL": "1h"}, "AGG_LEASE_TTL=1h0m0s"},
		{envVars{"AGG_LEASE_TTL": "soon"}, "AGG_LEASE_TTL"},
		{envVars{"AGG_FILTER": "gpu.sample.>"}, "AGG_FILTER"},
		{envVars{"AGG_ACK_WAIT": "10m"}, "AGG_ACK_WAIT"}, // no longer used: refused, not ignored
		{envVars{"AGG_MAX_ACK_PENDING": "-1"}, "AGG_MAX_ACK_PENDING"},
		{envVars{"AGG_COMPRESSION": "5"}, "AGG_COMPRESSION"},
		{envVars{"AGG_LOG_LEVEL": "loud"}, "AGG_LOG_LEVEL"},
		{envVars{"AGG_STORE_REQUESTS": "maybe"}, "AGG_STORE_REQUESTS"},
		{envVars{"NATS_URL": "::"}, "NATS_URL"},
		{envVars{"CLICKHOUSE_DB": "a-b"}, "CLICKHOUSE_DB"},
	} {
		_, err := loadConfig(tc.vars.get)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v does not name %s", tc.vars, err, tc.want)
		}
	}
}

func TestBadPricesFileStopsStart(t *testing.T) {
	err := run(t.Context(), envVars{"AGG_PRICES": "/nonexistent/prices.json"}.get, testWriter{t})
	if err == nil || !strings.Contains(err.Error(), "AGG_PRICES") {
		t.Fatalf("got %v", err)
	}
}
