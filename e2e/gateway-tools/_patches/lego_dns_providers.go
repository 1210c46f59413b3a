// Package dns stands in for lego's registry of ACME DNS-challenge providers in the harness's
// Traefik build.
//
// Lego's generated registry imports every DNS provider, and a dozen of the providers' SDK
// modules are not served by the module proxy, so the unmodified package cannot be built here.
// The harness's Traefik build puts this file in place of the registry in a copy of lego
// (fleetserve_e2e.gateway.prepare_traefik_build): Traefik keeps its ACME provider
// (the e2e gateway serves plain HTTP on loopback and configures no certificate resolver), and
// a configuration that names a DNS challenge fails with this error instead of reaching a CA.
package dns

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

// NewDNSChallengeProviderByName reports that no DNS-challenge provider is built in.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS challenge provider %q is not built into the e2e harness's Traefik", name)
}
