package certgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

// The label on every Secret certgen keeps.
const (
	ManagedByKey   = "app.kubernetes.io/managed-by"
	ManagedByValue = "kube-mvp-certgen"
)

// Secrets are where KeepSecrets keeps the state: a CA Secret and one Secret per role, in one
// namespace (layout.go: their keys).
type Secrets struct {
	Namespace string
	CASecret  string
	Roles     []RoleSecret
	// Labels are put on every Secret besides ManagedByKey.
	Labels map[string]string
}

// RoleSecret is a role and the Secret that holds its certificate.
type RoleSecret struct {
	Role cptls.Role
	Name string
}

// ErrBadSecret is a Secret certgen must not touch (of the wrong type).
var ErrBadSecret = errors.New("bad Secret")

// KeepSecrets keeps the state in Secrets: reads them, renews (Renew at now, for specs under
// p), writes what changed (the CA Secret first: a certificate is never stored without the CA
// that signed it), logs what it did and returns a one-line summary. A Secret of the wrong
// type is an ErrBadSecret.
func KeepSecrets(ctx context.Context, client kubernetes.Interface, opts Secrets, specs []Spec, p Policy, now time.Time, log *slog.Logger) (string, error) {
	secrets := client.CoreV1().Secrets(opts.Namespace)
	get := func(name string, typ corev1.SecretType) (*corev1.Secret, error) {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading Secret %s/%s: %w%s", opts.Namespace, name, err, rbacHint(err, "get"))
		case s.Type != typ:
			return nil, fmt.Errorf("%w: Secret %s/%s has type %s, want %s (the type cannot be changed: delete the Secret and run again, or name another one)",
				ErrBadSecret, opts.Namespace, name, s.Type, typ)
		}
		return s, nil
	}

	var cur State
	caSecret, err := get(opts.CASecret, corev1.SecretTypeOpaque)
	if err != nil {
		return "", err
	}
	if caSecret != nil {
		cur.SetCAData(caSecret.Data)
		if renewRequested(caSecret) {
			cur.RenewAllRequest = fmt.Sprintf("annotation %s on Secret %s/%s: every role's certificate", RenewAnnotation, opts.Namespace, opts.CASecret)
		}
	}
	cur.Leaves = map[cptls.Role]Leaf{}
	roleSecrets := map[cptls.Role]*corev1.Secret{}
	for _, rs := range opts.Roles {
		s, err := get(rs.Name, corev1.SecretTypeTLS)
		if err != nil {
			return "", err
		}
		if s != nil {
			roleSecrets[rs.Role] = s
			leaf := LeafFromData(s.Data)
			if renewRequested(s) {
				leaf.RenewRequest = "annotation " + RenewAnnotation
			}
			cur.Leaves[rs.Role] = leaf
		}
	}

	next, changes, err := Renew(now, cur, specs, p)
	if err != nil {
		return "", err
	}
	logChanges(log, changes)

	// written is what was done to each Secret: "created" or "updated" (the CA Secret may be
	// updated twice: its data, then its renewal request).
	written := map[string]string{}
	// write stores data under keys in Secret name (old: as read, nil if missing) and, with
	// clearRequest, removes its renewal request; it returns the Secret as stored.
	write := func(name string, old *corev1.Secret, typ corev1.SecretType, keys []string, data map[string][]byte, clearRequest bool) (*corev1.Secret, error) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: opts.Namespace}, Type: typ}
		if old != nil {
			s = old.DeepCopy()
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		var changedKeys []string
		for _, k := range keys {
			v, want := data[k]
			if have, ok := s.Data[k]; ok != want || !bytes.Equal(have, v) {
				changedKeys = append(changedKeys, k)
			}
			if want {
				s.Data[k] = v
			} else {
				delete(s.Data, k)
			}
		}
		labels := maps.Clone(opts.Labels)
		labels[ManagedByKey] = ManagedByValue
		var changedLabels []string
		for k, v := range labels {
			if s.Labels[k] != v {
				changedLabels = append(changedLabels, k)
				s.Labels[k] = v
			}
		}
		slices.Sort(changedLabels)
		cleared := false
		if _, ok := s.Annotations[RenewAnnotation]; ok && clearRequest {
			delete(s.Annotations, RenewAnnotation)
			cleared = true
		}
		switch {
		case old == nil:
			stored, err := secrets.Create(ctx, s, metav1.CreateOptions{FieldManager: ManagedByValue})
			if err != nil {
				return nil, fmt.Errorf("creating Secret %s/%s: %w%s", opts.Namespace, name, err, rbacHint(err, "create"))
			}
			written[name] = "created"
			log.Info("Secret created", "secret", opts.Namespace+"/"+name, "keys", strings.Join(slices.Sorted(maps.Keys(s.Data)), ","))
			return stored, nil
		case len(changedKeys) > 0 || len(changedLabels) > 0 || cleared:
			// Update carries the resourceVersion read: a Secret changed since is a conflict.
			stored, err := secrets.Update(ctx, s, metav1.UpdateOptions{FieldManager: ManagedByValue})
			if err != nil {
				if apierrors.IsConflict(err) {
					return nil, fmt.Errorf("the Secret %s/%s changed since it was read (another certgen run?): nothing more was written; run again: %w", opts.Namespace, name, err)
				}
				return nil, fmt.Errorf("updating Secret %s/%s: %w%s", opts.Namespace, name, err, rbacHint(err, "update"))
			}
			if written[name] == "" {
				written[name] = "updated"
			}
			attrs := []any{"secret", opts.Namespace + "/" + name, "keys", strings.Join(changedKeys, ","), "labels", strings.Join(changedLabels, ",")}
			if cleared {
				attrs = append(attrs, "annotation removed", RenewAnnotation)
			}
			log.Info("Secret updated", attrs...)
			return stored, nil
		}
		return old, nil
	}
	// The CA Secret's renewal request is removed last, once every role's certificate is
	// stored: a run that fails before leaves it for the next run.
	stored, err := write(opts.CASecret, caSecret, corev1.SecretTypeOpaque, CAKeys, next.CAData(), false)
	if err != nil {
		return "", err
	}
	for _, rs := range opts.Roles {
		if _, err := write(rs.Name, roleSecrets[rs.Role], corev1.SecretTypeTLS, LeafKeys, next.Leaves[rs.Role].Data(), true); err != nil {
			return "", err
		}
	}
	if renewRequested(stored) {
		if _, err := write(opts.CASecret, stored, corev1.SecretTypeOpaque, CAKeys, next.CAData(), true); err != nil {
			return "", err
		}
	}
	var created, updated, unchanged int
	for _, name := range append([]string{opts.CASecret}, secretNames(opts.Roles)...) {
		switch written[name] {
		case "created":
			created++
		case "updated":
			updated++
		default:
			unchanged++
		}
	}
	return fmt.Sprintf("certgen: %d change(s); Secrets in %s: %d created, %d updated, %d unchanged", len(changes), opts.Namespace, created, updated, unchanged), nil
}

// renewRequested reports whether s (nil: missing) asks for a renewal now: it carries the
// annotation RenewAnnotation, whatever its value.
func renewRequested(s *corev1.Secret) bool {
	if s == nil {
		return false
	}
	_, ok := s.Annotations[RenewAnnotation]
	return ok
}

func secretNames(rs []RoleSecret) []string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return names
}

// rbacHint says which permission is missing when err is Forbidden.
func rbacHint(err error, verb string) string {
	if !apierrors.IsForbidden(err) {
		return ""
	}
	return fmt.Sprintf(" (the caller may not %s it: certgen needs get, create and update on these Secrets; see the chart's certgen Role)", verb)
}

// logChanges logs each change with its reason, or that nothing was due.
func logChanges(log *slog.Logger, changes []Change) {
	for _, c := range changes {
		log.Info(c.What+" "+c.Action, "reason", c.Reason)
	}
	if len(changes) == 0 {
		log.Info("nothing due: every certificate and trust bundle is current")
	}
}
