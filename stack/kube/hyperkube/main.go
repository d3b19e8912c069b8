// hyperkube: the five Kubernetes node and control-plane components, and kubectl, in one binary,
// picked by the name it is run as (argv[0]), as the old hyperkube did. Built by stack/kube/build.sh from the Go
// module proxy: k8s.io/kubernetes cannot be `go install`ed (its go.mod points the k8s.io staging
// modules at ./staging, which the module zip omits), so this module requires it and replaces each
// staging module with its published release.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones (apiserver, controller-manager)

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kube-proxy":              proxy.NewProxyCommand,
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
		"kubectl":                 kubectl.NewDefaultKubectlCommand,
	}
	name := filepath.Base(os.Args[0])
	make, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "hyperkube: run me as one of kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl (a symlink), not %q\n", name)
		os.Exit(2)
	}
	if name == "kubectl" { // as kubectl's own main: its errors printed its way, not klog's
		if err := cli.RunNoErrOutput(make()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	os.Exit(cli.Run(make()))
}
