// Command deviceplugin advertises virtual GPUs on the test node as `nvidia.com/gpu`, through the
// kubelet's device-plugin API (v1beta1) as NVIDIA's device plugin does, with no GPU behind them:
// the kubelet counts, admits and assigns the devices for real; a container given some gets
// NVIDIA_VISIBLE_DEVICES naming their fake UUIDs (GPU-<node>-<index>), and nothing else.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const resource = "nvidia.com/gpu"

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once (they never change health) and holds the stream open.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("allocate %v", c.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	gpus := flag.Int("gpus", 2, "how many virtual GPUs to advertise")
	node := flag.String("node", "node", "the node's name, part of each device's fake UUID")
	flag.Parse()

	p := &plugin{}
	for i := 0; i < *gpus; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("GPU-%s-%d", *node, i), Health: pluginapi.Healthy})
	}
	dir := filepath.Join(*kubeletDir, "device-plugins")
	endpoint := "gpupool-gpu.sock"
	// The kubelet empties its device-plugins folder when it starts, so the socket is made only
	// once the kubelet's own answers, and made again if registering fails.
	for {
		server, err := serve(p, filepath.Join(dir, endpoint))
		if err == nil {
			err = register(filepath.Join(dir, "kubelet.sock"), endpoint)
			if err == nil {
				log.Printf("registered %d %s with the kubelet", *gpus, resource)
				select {}
			}
			server.Stop()
		}
		log.Printf("register: %v (retrying)", err)
		time.Sleep(500 * time.Millisecond)
	}
}

func serve(p *plugin, sock string) (*grpc.Server, error) {
	if _, err := os.Stat(filepath.Join(filepath.Dir(sock), "kubelet.sock")); err != nil {
		return nil, err
	}
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(lis) }()
	return server, nil
}

func register(kubeletSock, endpoint string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}
