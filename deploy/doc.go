// Package deploy holds tokenscope's deployment: compose.yaml, the Dockerfiles of the
// service images, Grafana's provisioning and dashboards, and the tests that check them
// without a Docker engine: the compose file as docker compose loads it (compose-go), every
// variable it sets against the services' Go configuration, every Dockerfile against the
// tree, every dashboard query against ClickHouse over data the pipeline wrote, and the
// services' READMEs (their variable and metric tables) against their source.
package deploy
