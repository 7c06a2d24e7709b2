//! The generated Talos API types (see `proto/README.md`): Talos' packages `common`, `machine`
//! and `cluster`, with tonic clients and servers. Generated code; nothing else lives here.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Package `google.rpc` (the gRPC status carried in `common.Metadata`).
pub mod google {
    /// `google.rpc`.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Package `common`.
pub mod common {
    tonic::include_proto!("common");
}

/// Package `machine`.
pub mod machine {
    tonic::include_proto!("machine");
}

/// Package `cluster`.
pub mod cluster {
    tonic::include_proto!("cluster");
}
