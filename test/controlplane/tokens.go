package controlplane

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountToken asks the server, as admin, for a token of the ServiceAccount name in
// namespace, valid for an hour: the credentials a pod of that ServiceAccount would have.
func (s *Server) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	client, err := s.Client()
	if err != nil {
		return "", err
	}
	tok, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tok.Status.Token, nil
}

// WriteTokenKubeconfig writes to path a kubeconfig for this server that authenticates with
// the bearer token; a non-empty namespace becomes its context's default namespace.
func (s *Server) WriteTokenKubeconfig(path, token, namespace string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cp"] = &clientcmdapi.Cluster{Server: s.URL(), CertificateAuthorityData: s.cp.PKI.ServerCA.CertPEM}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "cp", AuthInfo: "sa", Namespace: namespace}
	kc.CurrentContext = "sa"
	return clientcmd.WriteToFile(*kc, path)
}
