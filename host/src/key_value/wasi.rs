//! `wasi:keyvalue/store` and `wasi:keyvalue/atomics` (`0.2.0-draft2`, as Spin 3 provides them)
//! over the same stores as `fermyon:spin/key-value`: a bucket is a store opened by its label,
//! with the same access rules ([`super::binding`]), and `increment` is the backend's atomic
//! add (a transaction on the local file, `INCRBY` on Redis).

use wasmtime::component::Resource;

use super::binding::{KeyValueView, KvStore};
use crate::bindings::fermyon::spin::key_value::Error as SpinError;
use crate::bindings::wasi::keyvalue::{atomics, store};

fn wasi_error(e: SpinError) -> store::Error {
    match e {
        SpinError::NoSuchStore => store::Error::NoSuchStore,
        SpinError::AccessDenied => store::Error::AccessDenied,
        SpinError::StoreTableFull => store::Error::Other("too many stores opened".into()),
        SpinError::Other(message) => store::Error::Other(message),
    }
}

impl store::Host for KeyValueView<'_> {
    #[tracing::instrument(name = "wasi_key_value.open", skip_all, fields(otel.kind = "client"))]
    async fn open(
        &mut self,
        identifier: String,
    ) -> wasmtime::Result<Result<Resource<KvStore>, store::Error>> {
        Ok(self.open_store(identifier).map_err(wasi_error))
    }
}

impl store::HostBucket for KeyValueView<'_> {
    #[tracing::instrument(name = "wasi_key_value.get", skip_all, fields(otel.kind = "client"))]
    async fn get(
        &mut self,
        bucket: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend.get(label, key).await.map_err(wasi_error))
    }

    #[tracing::instrument(name = "wasi_key_value.set", skip_all, fields(otel.kind = "client"))]
    async fn set(
        &mut self,
        bucket: Resource<KvStore>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend.set(label, key, value).await.map_err(wasi_error))
    }

    #[tracing::instrument(name = "wasi_key_value.delete", skip_all, fields(otel.kind = "client"))]
    async fn delete(
        &mut self,
        bucket: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend.delete(label, key).await.map_err(wasi_error))
    }

    #[tracing::instrument(name = "wasi_key_value.exists", skip_all, fields(otel.kind = "client"))]
    async fn exists(
        &mut self,
        bucket: Resource<KvStore>,
        key: String,
    ) -> wasmtime::Result<Result<bool, store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend.exists(label, key).await.map_err(wasi_error))
    }

    /// Every key at once: the stores here are small, so there is never a next page.
    #[tracing::instrument(name = "wasi_key_value.list_keys", skip_all, fields(otel.kind = "client"))]
    async fn list_keys(
        &mut self,
        bucket: Resource<KvStore>,
        _cursor: Option<String>,
    ) -> wasmtime::Result<Result<store::KeyResponse, store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend
            .keys(label)
            .await
            .map(|keys| store::KeyResponse { keys, cursor: None })
            .map_err(wasi_error))
    }

    async fn drop(&mut self, bucket: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl atomics::Host for KeyValueView<'_> {
    #[tracing::instrument(name = "spin_key_value.increment", skip_all, fields(otel.kind = "client"))]
    async fn increment(
        &mut self,
        bucket: Resource<KvStore>,
        key: String,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, store::Error>> {
        let (label, backend) = self.backend(&bucket)?;
        Ok(backend
            .increment(label, key, delta)
            .await
            .map_err(wasi_error))
    }
}
