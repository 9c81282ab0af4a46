// Package dashboard reads Grafana dashboards of the ClickHouse data source and turns
// their queries into the SQL that reaches ClickHouse: Grafana's template variables are
// interpolated as Grafana does, then the plugin's macros ($__timeFilter, $__fromTime,
// $__interval_s, …) are expanded as grafana-clickhouse-datasource expands them, so a test
// can run every panel against a real server.
package dashboard
