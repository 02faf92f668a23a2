package fleet

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Price is an hourly price: spot (what the runs paid) and on demand.
type Price struct {
	Spot     float64 `json:"spot"`
	OnDemand float64 `json:"on_demand"`
}

// Prices prices machine time by instance type.
type Prices struct {
	Default Price            // --price-per-hour, --on-demand-price-per-hour
	ByType  map[string]Price // "p4d.24xlarge" or "aws/p4d.24xlarge"
}

// For is the price of k: "cloud/instance-type", then the instance type,
// then Default.
func (p Prices) For(k Key) Price {
	if pr, ok := p.ByType[k.Cloud+"/"+k.InstanceType]; ok {
		return pr
	}
	if pr, ok := p.ByType[k.InstanceType]; ok {
		return pr
	}
	return p.Default
}

// ReadPrices parses a price file: one line per instance type,
// "instance_type,spot,on_demand" (per hour, one currency), the type
// optionally as cloud/type; blank lines, # comments and a header line
// starting with "instance_type" are skipped. An empty on_demand is 0.
func ReadPrices(r io.Reader) (map[string]Price, error) {
	out := map[string]Price{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "instance_type") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("price file line %d: want instance_type,spot,on_demand", n)
		}
		var p Price
		var err error
		if p.Spot, err = strconv.ParseFloat(strings.TrimSpace(f[1]), 64); err != nil || p.Spot < 0 {
			return nil, fmt.Errorf("price file line %d: spot price %q", n, f[1])
		}
		if len(f) == 3 && strings.TrimSpace(f[2]) != "" {
			if p.OnDemand, err = strconv.ParseFloat(strings.TrimSpace(f[2]), 64); err != nil || p.OnDemand < 0 {
				return nil, fmt.Errorf("price file line %d: on-demand price %q", n, f[2])
			}
		}
		out[strings.TrimSpace(f[0])] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("price file: %w", err)
	}
	return out, nil
}
