// gpupool-devfilter: the cgroup v2 half of a workload's device limit (gpupool.contain.devfilter).
//
// cgroup v2 has no devices.allow/devices.deny files: the kernel asks a BPF_CGROUP_DEVICE program
// attached to the cgroup at each open(2) and mknod(2) of a device node. Building and attaching
// that program is runc's job too, so this uses runc's own code (github.com/opencontainers/cgroups
// /devices, on cilium/ebpf): the same rule emulator as cgroup v1, the same program, and an atomic
// replacement of the program already attached (BPF_F_REPLACE), so a workload is never a moment
// without rules and a change of GPUs is make-before-break when the caller asks for both ends first.
//
//	gpupool-devfilter <cgroup2 directory> < rules
//
// rules: one a line in the cgroup v1 syntax with its verb: "allow a *:* rwm", "deny c 195:3 rwm".
// Exit 0 once attached; else 1 and the reason on stderr. Run as root.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // registers cgroups.DevicesSetV2
	devices "github.com/opencontainers/cgroups/devices/config"
)

const maxRules = 4096

func number(s string) (int64, error) {
	if s == "*" {
		return devices.Wildcard, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a device number: %.20q", s)
	}
	return n, nil
}

// parse reads one rule: "<allow|deny> <a|b|c> <major|*>:<minor|*> <rwm>".
func parse(line string) (*devices.Rule, error) {
	f := strings.Fields(line)
	if len(f) != 4 || (f[0] != "allow" && f[0] != "deny") {
		return nil, fmt.Errorf("not a rule: %.80q", line)
	}
	rule := &devices.Rule{Allow: f[0] == "allow", Permissions: devices.Permissions(f[3])}
	switch f[1] {
	case "a":
		rule.Type, rule.Major, rule.Minor = devices.WildcardDevice, devices.Wildcard, devices.Wildcard
	case "b":
		rule.Type = devices.BlockDevice
	case "c":
		rule.Type = devices.CharDevice
	default:
		return nil, fmt.Errorf("not a device type: %.80q", line)
	}
	if strings.Trim(f[3], "rwm") != "" || f[3] == "" {
		return nil, fmt.Errorf("not permissions: %.80q", line)
	}
	if rule.Type != devices.WildcardDevice {
		major, minor, ok := strings.Cut(f[2], ":")
		var err1, err2 error
		rule.Major, err1 = number(major)
		rule.Minor, err2 = number(minor)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("not major:minor: %.80q", line)
		}
	}
	return rule, nil
}

func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: gpupool-devfilter <cgroup2 directory> < rules")
	}
	var rules []*devices.Rule
	scan := bufio.NewScanner(os.Stdin)
	for scan.Scan() {
		if strings.TrimSpace(scan.Text()) == "" {
			continue
		}
		if len(rules) == maxRules {
			return fmt.Errorf("more than %d rules", maxRules)
		}
		rule, err := parse(scan.Text())
		if err != nil {
			return err
		}
		rules = append(rules, rule)
	}
	if err := scan.Err(); err != nil {
		return err
	}
	if len(rules) == 0 {
		return errors.New("no rules on stdin")
	}
	return cgroups.DevicesSetV2(os.Args[1], &cgroups.Resources{Devices: rules})
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gpupool-devfilter:", err)
		os.Exit(1)
	}
}
