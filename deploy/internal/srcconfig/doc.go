// Package srcconfig reads, from a service's Go source, what it accepts and exposes: the
// environment variables its caarlos0/env Config struct parses (following envPrefix nesting
// into other packages of the repository), the flags its subcommands define, and, for the
// whole binary (Program: the main package and the repository's packages it imports), every
// environment variable it reads and every metric name it defines. The services' configs live
// in package main and cannot be imported, so the source is the contract.
package srcconfig
