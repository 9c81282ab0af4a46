// Package srcconfig reads, from a service's Go source, what it accepts: the environment
// variables its caarlos0/env Config struct parses (following envPrefix nesting into other
// packages of the repository) and the flags its subcommands define. The services' configs
// live in package main and cannot be imported, so the source is the contract.
package srcconfig
