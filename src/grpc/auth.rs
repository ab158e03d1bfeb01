//! The ledger service's authentication: an interceptor that maps `authorization: Bearer
//! <token>` to a [`Tenant`](crate::domain::Tenant) and its role ([`crate::credentials`]) before
//! any request is read. It wraps the ledger service only; health and reflection stay open so
//! load balancers and grpcurl need no secret. A call is authenticated once, when it arrives,
//! so a call in flight finishes under the credential it started with.

use tonic::{Request, Status};

use super::error::CallError;
use crate::credentials::{Approver, Credentials, Unauthenticated};

impl From<Unauthenticated> for CallError {
    fn from(refused: Unauthenticated) -> CallError {
        CallError::Unauthenticated(refused.0)
    }
}

/// The interceptor for the ledger service: puts the tenant and the role of the credentials in
/// force when the call arrives in the request extensions.
pub fn interceptor(
    credentials: &Credentials,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + use<> {
    let credentials = credentials.clone();
    move |mut request: Request<()>| {
        let identity = credentials
            .authenticate(request.metadata())
            .map_err(|refused| Status::from(CallError::from(refused)))?;
        request.extensions_mut().insert(identity.tenant);
        request.extensions_mut().insert(Approver(identity.approver));
        Ok(request)
    }
}
