module github.com/agenthold/egress/examples/adopt

go 1.26.0

require (
	github.com/agenthold/egress v0.0.0
	github.com/miekg/dns v1.1.73
	github.com/stretchr/testify v1.12.1
)

require (
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/crypto v0.59.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

replace github.com/agenthold/egress => ../..
