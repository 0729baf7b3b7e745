//! Capacity providers: the `CapacityProvider` trait and its adapters (AWS EKS/EC2, static inventory, simulated clouds) that obtain accelerator nodes for CapacityClaims.
