//! AWS adapter (EKS managed node groups + EC2 discovery).
