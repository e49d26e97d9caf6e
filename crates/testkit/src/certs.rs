//! Certificates for TLS tests: a CA, and process certificates for loopback it signs.

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA: its certificate (PEM) and the issuer that signs with it.
pub fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("rcgen");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("rcgen");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("rcgen");
    (cert.pem(), Issuer::new(params, key))
}

/// A process certificate for loopback (server and client use), signed by `issuer`: the
/// certificate and key PEM.
pub fn node(issuer: &Issuer<'static, KeyPair>) -> (String, String) {
    let key = KeyPair::generate().expect("rcgen");
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("rcgen");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, issuer).expect("rcgen");
    (cert.pem(), key.serialize_pem())
}
