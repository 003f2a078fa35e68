// Package deploy holds kube-mvp's Helm chart (kube-mvp/) and its tests: the chart is rendered
// with Helm's Go library for the default values and every documented option, each manifest is
// decoded strictly, applied with server-side dry-run to a real kube-apiserver, the RBAC is
// checked by SubjectAccessReview for the chart's service account, and xds-server and extproc
// are run with exactly the arguments the chart gives them, with the service account's token.
package deploy
