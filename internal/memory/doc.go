// Package memory is what xds-server keeps in its memory ConfigMap, pure and without client-go:
// what departed apiservers served (Memory: memory.go) and the identity header names learnt
// (RequestHeaderNames: headernames.go), each signed with xds-server's key and believed only
// if that signature, its signer and the bounds check out (sign.go, headernamessign.go).
//
// internal/inventory reads and writes the ConfigMap; objects.Build reads a Memory as
// Objects.Remembered and the header names as Objects.HeaderNames, so this package imports
// neither (objects imports it, and extproc links no client-go: cmd/extproc's TestNoClientGo).
package memory
