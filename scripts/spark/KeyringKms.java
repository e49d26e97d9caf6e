// Iceberg's KeyManagementClient over ClearIce's keyring file, for the Spark-written tables
// that Iceberg encrypts itself (crates/engine/tests/python/spark_native.py compiles it
// against Iceberg's Spark runtime). A test peer: nothing here ships with ClearIce.
//
// Wrapped keys are nonce(12) || AES-GCM(master key, key, aad = master key id) || tag(16):
// ClearIce's keyring wrap format (which base64-encodes these bytes in PME key material).
// The keyring file is `{"id": "<base64>"}` or `{"id": ["<base64 v1>", "<base64 v2>"]}`
// (oldest first); wrapping uses the newest version, unwrapping tries newest first.
package clearice.test;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.apache.iceberg.encryption.KeyManagementClient;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;

public class KeyringKms implements KeyManagementClient {
  private static final int NONCE = 12;
  private static final int TAG_BITS = 128;
  private Map<String, List<byte[]>> keys = new HashMap<>();

  @Override
  public void initialize(Map<String, String> properties) {
    String path = properties.get("clearice.keyring");
    if (path == null) {
      throw new IllegalArgumentException("catalog property 'clearice.keyring' is not set");
    }
    try {
      JsonNode root = new ObjectMapper().readTree(Files.readAllBytes(Paths.get(path)));
      Iterator<Map.Entry<String, JsonNode>> fields = root.fields();
      while (fields.hasNext()) {
        Map.Entry<String, JsonNode> e = fields.next();
        List<byte[]> versions = new ArrayList<>();
        if (e.getValue().isArray()) {
          for (JsonNode v : e.getValue()) {
            versions.add(Base64.getDecoder().decode(v.asText().trim()));
          }
        } else {
          versions.add(Base64.getDecoder().decode(e.getValue().asText().trim()));
        }
        keys.put(e.getKey(), versions);
      }
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException("keyring " + path + " cannot be read", e);
    }
  }

  private List<byte[]> versions(String id) {
    List<byte[]> v = keys.get(id);
    if (v == null) {
      throw new IllegalArgumentException("keyring has no master key '" + id + "'");
    }
    return v;
  }

  @Override
  public ByteBuffer wrapKey(ByteBuffer key, String wrappingKeyId) {
    List<byte[]> v = versions(wrappingKeyId);
    byte[] master = v.get(v.size() - 1);
    byte[] plain = new byte[key.remaining()];
    key.duplicate().get(plain);
    byte[] nonce = new byte[NONCE];
    new SecureRandom().nextBytes(nonce);
    try {
      Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
      c.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(master, "AES"), new GCMParameterSpec(TAG_BITS, nonce));
      c.updateAAD(wrappingKeyId.getBytes(StandardCharsets.UTF_8));
      byte[] sealed = c.doFinal(plain);
      ByteBuffer out = ByteBuffer.allocate(NONCE + sealed.length);
      out.put(nonce).put(sealed).flip();
      return out;
    } catch (GeneralSecurityException e) {
      throw new RuntimeException("wrapping under '" + wrappingKeyId + "' failed", e);
    }
  }

  @Override
  public ByteBuffer unwrapKey(ByteBuffer wrappedKey, String wrappingKeyId) {
    byte[] data = new byte[wrappedKey.remaining()];
    wrappedKey.duplicate().get(data);
    List<byte[]> v = versions(wrappingKeyId);
    for (int i = v.size() - 1; i >= 0; i--) {
      try {
        Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
        c.init(
            Cipher.DECRYPT_MODE,
            new SecretKeySpec(v.get(i), "AES"),
            new GCMParameterSpec(TAG_BITS, data, 0, NONCE));
        c.updateAAD(wrappingKeyId.getBytes(StandardCharsets.UTF_8));
        return ByteBuffer.wrap(c.doFinal(data, NONCE, data.length - NONCE));
      } catch (GeneralSecurityException e) {
        // try an older version
      }
    }
    throw new RuntimeException("unwrapping under '" + wrappingKeyId + "' failed");
  }
}
