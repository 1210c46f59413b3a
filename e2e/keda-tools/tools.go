//go:build tools

// Package tools pins KEDA's operator and metrics API server (the adapter) for the e2e
// harness.  The imports keep `go mod tidy` from dropping their dependencies; nothing builds
// this file, the harness builds the two commands with `go build` in this module.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
