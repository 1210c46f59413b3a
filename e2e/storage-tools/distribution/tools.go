//go:build tools

// Package tools pins CNCF Distribution, whose `registry` command is the OCI registry the e2e
// harness pushes model artifacts to.  The import keeps `go mod tidy` from dropping its
// dependencies; nothing builds this file, the harness builds the command with `go build` in
// this module.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
