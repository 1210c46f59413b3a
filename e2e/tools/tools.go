//go:build tools

// Package tools pins modules that are needed for their files rather than for a command:
// the Gateway API CRD manifests under sigs.k8s.io/gateway-api/config/crd.
// The import keeps `go mod tidy` from dropping the requirement; nothing builds this file.
package tools

import _ "sigs.k8s.io/gateway-api/apis/v1"
